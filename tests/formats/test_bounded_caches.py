"""The decoders' per-message caches stay within their documented sizes, whatever the messages hold;
and a Canal message with no row is counted, never silently dropped."""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable

import orjson
import pytest

from cdcflow.formats import DecodeOutput, Message, parse_ddl, resolve_format
from cdcflow.formats.debezium.json import DebeziumJsonDecoder
from cdcflow.formats.flat_json.canal import CanalJsonDecoder
from cdcflow.formats.lru import FILL_STATE_KEYS, SCHEMA_CACHE_SIZE, LruCache

DISTINCT = SCHEMA_CACHE_SIZE + 300


def connect_event(version: int) -> bytes:
    """A Debezium event in Kafka Connect's {schema, payload} form; each version a distinct schema block."""
    value = {
        "type": "struct",
        "optional": True,
        "name": f"db.t.Value{version}",
        "fields": [
            {"type": "int32", "optional": False, "field": "id"},
            {"type": "string", "optional": True, "field": "name"},
        ],
    }
    schema = {
        "type": "struct",
        "name": "db.t.Envelope",
        "fields": [
            {**value, "field": "before"},
            {**value, "field": "after"},
            {"type": "string", "field": "op"},
        ],
    }
    payload = {"before": None, "after": {"id": version, "name": "x"}, "op": "c"}
    return orjson.dumps({"schema": schema, "payload": payload})


def test_debezium_schema_blocks_are_cached_up_to_the_documented_size() -> None:
    decoder = resolve_format("debezium-json").create_decoder({"schema-include": "true"})
    assert isinstance(decoder, DebeziumJsonDecoder)
    out = decoder.decode_all(Message(connect_event(i)) for i in range(DISTINCT))
    assert out.metrics.changes == DISTINCT and not out.dead_letters
    assert len(decoder._by_connect_schema) == SCHEMA_CACHE_SIZE
    # a forgotten schema decodes again (its converters rebuilt); the cache does not grow
    again = decoder.decode_all([Message(connect_event(0))])
    assert again.changes[0].row == {"id": 0, "name": "x"}
    assert len(decoder._by_connect_schema) == SCHEMA_CACHE_SIZE


def test_canal_mysql_type_maps_are_cached_up_to_the_documented_size() -> None:
    decoder = resolve_format("canal-json").create_decoder({})
    assert isinstance(decoder, CanalJsonDecoder)
    messages = [
        Message(
            orjson.dumps(
                {
                    "type": "INSERT",
                    "data": [{"id": "1", f"c{i}": "x"}],
                    "mysqlType": {"id": "int", f"c{i}": "text"},
                }
            )
        )
        for i in range(DISTINCT)
    ]
    out = decoder.decode_all(messages)
    assert out.metrics.changes == DISTINCT and not out.dead_letters
    assert len(decoder._by_mysql_types) == SCHEMA_CACHE_SIZE


def test_avro_writer_schemas_are_bounded_too() -> None:
    from tests.formats.avro_events import ENVELOPE_TEXT, FACTORY, messages

    # The schema option stands for every id (no schema-id): one cache entry per id seen, the last 1024.
    decoder = FACTORY.create_decoder({"schema": ENVELOPE_TEXT})
    for schema_id in range(SCHEMA_CACHE_SIZE + 10):
        assert len(decoder.decode_all(messages(schema_id)[:1]).changes) == 1
    assert decoder._values is not None
    writers = decoder._values.schemas._entries
    assert isinstance(writers, LruCache) and len(writers) == SCHEMA_CACHE_SIZE
    keyed = FACTORY.create_decoder({"url": "mock://bounded-keys"})
    assert keyed._key(Message(b"", key=b"\x00\x00\x00\x00\x01\x02")) is None  # id 1: not registered
    assert keyed._keys is not None
    keys = keyed._keys.schemas._entries
    assert isinstance(keys, LruCache) and keys.size == SCHEMA_CACHE_SIZE


def test_toast_fill_state_keeps_the_last_keys_and_reports_beyond_them() -> None:
    decoder = resolve_format("debezium-json").create_decoder(
        {"changelog-mode": "upsert", "key-columns": "id"},
        parse_ddl("id INT NOT NULL, body STRING"),
        ["unavailable-columns"],
    )
    assert isinstance(decoder, DebeziumJsonDecoder) and decoder._builder._images is not None
    keys = FILL_STATE_KEYS + 50
    inserts = [orjson.dumps({"op": "c", "after": {"id": i, "body": f"b{i}"}}) for i in range(keys)]
    out = decoder.decode_all(Message(value) for value in inserts)
    assert out.metrics.changes == keys
    assert len(decoder._builder._images) == FILL_STATE_KEYS

    def unchanged(key: int) -> dict[str, object]:
        value = orjson.dumps({"op": "u", "after": {"id": key, "body": "__debezium_unavailable_value"}})
        result = decoder.decode_all([Message(value)])
        return result.changes[-1].row

    assert unchanged(keys - 1)["body"] == f"b{keys - 1}"  # a recent key: filled
    forgotten = unchanged(0)  # the least recently changed key is gone: reported, not filled
    assert forgotten["body"] is None and forgotten["unavailable_columns"] == ["body"]


@pytest.mark.parametrize("seed", range(20))
def test_putting_distinct_keys_at_once_leaves_what_putting_them_one_by_one_does(seed: int) -> None:
    """The columnar TOAST fill writes a block's keys at once (``put_all``), or leaves their values to be
    made when the cache is next used (``put_all_later``); the per-record decoder puts them one by one:
    all leave the same entries in the same order, whatever was there and whatever the sizes, and a
    value put later is made only if it stays."""
    rng = random.Random(seed)  # noqa: S311 - test data
    size = rng.randint(1, 8)
    one_by_one: LruCache[int, int] = LruCache(size)
    at_once: LruCache[int, int] = LruCache(size)
    later: LruCache[int, int] = LruCache(size)
    made: list[int] = []

    def values_of(keys: list[int], values: list[int]) -> Callable[[list[int]], list[int]]:
        def make(positions: list[int]) -> list[int]:
            made.extend(keys[p] for p in positions)
            return [values[p] for p in positions]

        return make

    for _ in range(12):
        for key in rng.sample(range(20), rng.randint(0, 6) if rng.random() < 0.3 else 0):  # one by one
            for cache in (one_by_one, at_once, later):
                cache.put(key, -key)
        keys = rng.sample(range(20), rng.randint(0, 12))
        values = [rng.randint(0, 99) for _ in keys]
        for key, value in zip(keys, values, strict=True):
            one_by_one.put(key, value)
        at_once.put_all(keys, values)
        later.put_all_later(keys, values_of(keys, values))
        if rng.random() < 0.3:
            made.clear()
            entries = later.entries()
            assert list(entries.items()) == list(one_by_one.entries().items())
            assert len(made) == len(set(made)) and set(made) <= set(entries)  # only values that stay
        assert list(at_once.entries().items()) == list(one_by_one.entries().items())
    assert list(later.entries().items()) == list(one_by_one.entries().items())


def test_writes_left_for_later_hold_a_bounded_number_of_blocks() -> None:
    """A hot key written by block after block: the blocks waiting to be settled (each holding its
    columns) stay few, however many the key's keys count."""
    cache: LruCache[int, int] = LruCache(FILL_STATE_KEYS)
    waiting: list[weakref.ref[Callable[[list[int]], list[int]]]] = []
    for block in range(200):

        def make(positions: list[int], value: int = block) -> list[int]:
            return [value for _ in positions]

        waiting.append(weakref.ref(make))
        cache.put_all_later([7], make)
        del make
    assert sum(ref() is not None for ref in waiting) <= 10  # of 200
    assert list(cache.entries().items()) == [(7, 199)]


def test_lru_cache_rejects_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LruCache[int, int](0)


@pytest.mark.parametrize(
    "message",
    [
        {"type": "INSERT", "data": []},
        {"type": "DELETE", "data": []},
        {"type": "UPDATE", "data": [], "old": []},
    ],
)
def test_a_canal_message_with_no_row_is_counted_as_empty(message: dict[str, object]) -> None:
    """Flink emits nothing for it either; here it moves the ``empty`` counter."""
    decoder = resolve_format("canal-json").create_decoder({}, parse_ddl("id INT NOT NULL"))
    out = DecodeOutput()
    decoder.decode(Message(orjson.dumps({**message, "database": "d", "table": "t"})), out)
    assert out.changes == [] and out.dead_letters == [] and out.events == []
    assert out.metrics.messages == 1 and out.metrics.empty == 1 and out.metrics.filtered == 0
