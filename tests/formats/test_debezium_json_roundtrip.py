"""decode(encode(changelog)) == changelog for debezium-json, with and without the schema block."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

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

naive = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))
values = {
    "name": st.text(max_size=8),
    "price": st.decimals(min_value=-(10**8), max_value=10**8, places=3, allow_nan=False),
    "amount": st.decimals(min_value=-(10**27), max_value=10**27, places=10, allow_nan=False),
    "at": naive,
    "seen": naive.map(lambda d: d.replace(tzinfo=dt.UTC)),
    "day": st.dates(min_value=dt.date(1, 1, 1)),
    "clock": st.times(),
    "raw": st.binary(max_size=6),
    "score": st.floats(allow_nan=False, allow_infinity=True),
    "ok": st.booleans(),
    "tags": st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=3),
}


@st.composite
def rows(draw: st.DrawFn, row_id: int) -> dict[str, Any]:
    row: dict[str, Any] = {"id": row_id}
    for name, strategy in values.items():
        row[name] = draw(st.one_of(st.none(), strategy))
    return row


@st.composite
def retract_changelogs(draw: st.DrawFn) -> list[Change]:
    """Per key: +I, then -U/+U pairs, maybe -D; keys interleaved but each key's changes in order."""
    changes: list[Change] = []
    for row_id in range(draw(st.integers(1, 4))):
        current = draw(rows(row_id))
        changes.append(Change(RowKind.INSERT, current))
        for _ in range(draw(st.integers(0, 2))):
            updated = draw(rows(row_id))
            changes += [Change(RowKind.UPDATE_BEFORE, current), Change(RowKind.UPDATE_AFTER, updated)]
            current = updated
        if draw(st.booleans()):
            changes.append(Change(RowKind.DELETE, current))
    return changes


def _round_trip(changes: list[Change], options: dict[str, str]) -> list[Change]:
    encoded = FACTORY.create_encoder(options, SCHEMA, ["id"]).encode_all(changes)
    decoder = FACTORY.create_decoder(options, None if options.get("schema-include") else SCHEMA)
    out = decoder.decode_all(Message(e.value, key=e.key, offset=i) for i, e in enumerate(encoded))
    assert out.dead_letters == [] and out.events == []
    return out.changes


def _normalised(changes: list[Change]) -> list[tuple[RowKind, dict[str, Any]]]:
    # Decimals compare by value (1.500 == 1.5) and keep their declared scale on the way back.
    return [
        (c.kind, {k: (v.normalize() if isinstance(v, Decimal) else v) for k, v in c.row.items()})
        for c in changes
    ]


@settings(max_examples=60, deadline=None)
@given(retract_changelogs())
def test_round_trip_without_schema_block(changes: list[Change]) -> None:
    assert _normalised(_round_trip(changes, {})) == _normalised(changes)


@settings(max_examples=60, deadline=None)
@given(retract_changelogs())
def test_round_trip_with_schema_block(changes: list[Change]) -> None:
    assert _normalised(_round_trip(changes, {"schema-include": "true"})) == _normalised(changes)


@settings(max_examples=40, deadline=None)
@given(retract_changelogs())
def test_round_trip_iso_timestamps(changes: list[Change]) -> None:
    options = {"timestamp-format.standard": "ISO-8601"}
    assert _normalised(_round_trip(changes, options)) == _normalised(changes)


@settings(max_examples=40, deadline=None)
@given(retract_changelogs())
def test_round_trip_upsert_mode_keeps_the_upserts(changes: list[Change]) -> None:
    upserts = [c for c in changes if c.kind is not RowKind.UPDATE_BEFORE]
    decoded = _round_trip(upserts, {"changelog-mode": "upsert"})
    assert _normalised(decoded) == _normalised(upserts)
