"""decode(encode(changelog)) == changelog for debezium-json, with and without the schema block."""

from __future__ import annotations

import pytest
from changelog_strategies import DEBEZIUM_VALUES, normalised, per_key_changelogs
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Message, parse_ddl, resolve_format

SCHEMA = parse_ddl(
    "id INT NOT NULL, name STRING, price DECIMAL(12, 3), amount DECIMAL(38, 10), at TIMESTAMP_NTZ(6), "
    "seen TIMESTAMP, day DATE, clock TIME(6), raw BINARY, score DOUBLE, ok BOOLEAN, tags ARRAY<STRING>"
)
FACTORY = resolve_format("debezium-json")

VALUES = {
    **DEBEZIUM_VALUES,
    "amount": st.decimals(min_value=-(10**27), max_value=10**27, places=10, allow_nan=False),
    "score": st.floats(allow_nan=False, allow_infinity=True),
}


def _round_trip(changes: list[Change], options: dict[str, str]) -> list[Change]:
    encoded = FACTORY.create_encoder(options, SCHEMA, ["id"]).encode_all(changes)
    decoder = FACTORY.create_decoder(options, None if options.get("schema-include") else SCHEMA)
    out = decoder.decode_all(Message(e.value, key=e.key, offset=i) for i, e in enumerate(encoded))
    assert out.dead_letters == [] and out.events == []
    return out.changes


@settings(max_examples=60, deadline=None)
@given(per_key_changelogs(VALUES))
def test_round_trip_without_schema_block(changes: list[Change]) -> None:
    assert normalised(_round_trip(changes, {})) == normalised(changes)


@settings(max_examples=60, deadline=None)
@given(per_key_changelogs(VALUES))
def test_round_trip_with_schema_block(changes: list[Change]) -> None:
    assert normalised(_round_trip(changes, {"schema-include": "true"})) == normalised(changes)


@settings(max_examples=40, deadline=None)
@given(per_key_changelogs(VALUES))
def test_round_trip_iso_timestamps(changes: list[Change]) -> None:
    options = {"timestamp-format.standard": "ISO-8601"}
    assert normalised(_round_trip(changes, options)) == normalised(changes)


@settings(max_examples=40, deadline=None)
@given(per_key_changelogs(VALUES))
def test_round_trip_upsert_mode_keeps_the_upserts(changes: list[Change]) -> None:
    upserts = [c for c in changes if c.kind is not RowKind.UPDATE_BEFORE]
    decoded = _round_trip(upserts, {"changelog-mode": "upsert"})
    assert normalised(decoded) == normalised(upserts)


@pytest.mark.parametrize(
    ("mode", "encoded"),
    [
        ("DROP", b'"m":[{"a":2}],"s":{"n":{"a":2}}'),
        ("LITERAL", b'"m":[{"nk":1,"a":2}],"s":{"n":{"nk":1,"a":2}}'),
    ],
)
def test_map_null_key_mode_reaches_maps_nested_in_arrays_and_rows(mode: str, encoded: bytes) -> None:
    schema = parse_ddl("id INT NOT NULL, m ARRAY<MAP<STRING, INT>>, s ROW<n MAP<STRING, INT>>")
    encoder = resolve_format("debezium-json").create_encoder(
        {"map-null-key.mode": mode, "map-null-key.literal": "nk"}, schema, ["id"]
    )
    row = {"id": 1, "m": [{None: 1, "a": 2}], "s": {"n": {None: 1, "a": 2}}}
    [event] = encoder.encode_all([Change(RowKind.INSERT, row)])
    assert encoded in event.value
